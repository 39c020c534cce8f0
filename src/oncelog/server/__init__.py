"""oncelog.server"""
