"""rollwise.train"""
