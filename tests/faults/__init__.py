"""Faults: corrupt caches, full disks, dead processes, hostile input."""
