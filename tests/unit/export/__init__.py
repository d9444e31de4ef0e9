"""Unit tests of core/export.py."""
