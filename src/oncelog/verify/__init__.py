"""oncelog.verify"""
