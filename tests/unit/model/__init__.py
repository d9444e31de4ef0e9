"""Unit tests of core/model/."""
