"""rollwise.engine"""
