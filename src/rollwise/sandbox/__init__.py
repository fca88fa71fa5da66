"""rollwise.sandbox"""
