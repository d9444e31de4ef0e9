"""Unit tests of core/cli/."""
