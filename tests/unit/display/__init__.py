"""Unit tests of core/display/."""
