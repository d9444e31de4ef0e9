"""Unit tests of core/sensitivity/."""
