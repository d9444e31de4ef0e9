"""Unit tests of core/jobs/."""
