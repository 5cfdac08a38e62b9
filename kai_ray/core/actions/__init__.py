"""Scheduling actions, run in order each cycle."""
