"""rollwise.models"""
