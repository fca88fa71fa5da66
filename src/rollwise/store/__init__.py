"""rollwise.store"""
