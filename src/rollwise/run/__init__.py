"""rollwise.run"""
