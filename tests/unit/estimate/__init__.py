"""Unit tests of core/estimate/."""
