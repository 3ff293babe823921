"""Prometheus metric families and OpenTelemetry spans every room records into; imports no other
room (servers/README.md).
"""
