"""Unit tests of core/measure/."""
