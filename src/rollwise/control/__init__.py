"""rollwise.control"""
