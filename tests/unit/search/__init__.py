"""Unit tests of core/search/."""
