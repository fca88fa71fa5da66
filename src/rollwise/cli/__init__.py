"""rollwise.cli"""
