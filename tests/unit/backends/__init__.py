"""Unit tests of core/backends/."""
