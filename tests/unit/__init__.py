"""Unit tests of core/: one folder per wing, project-level and architecture tests here."""
