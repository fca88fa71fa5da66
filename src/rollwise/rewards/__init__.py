"""rollwise.rewards"""
