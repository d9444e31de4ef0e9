"""Unit tests of core/store/."""
