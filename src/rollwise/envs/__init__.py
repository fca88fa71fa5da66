"""rollwise.envs"""
