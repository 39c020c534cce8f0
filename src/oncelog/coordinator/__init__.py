"""oncelog.coordinator"""
