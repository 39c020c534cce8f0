"""oncelog.spark"""
