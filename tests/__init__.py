"""mixprec's tests, by level: unit/ (one folder per wing of core/), app/, e2e/, faults/, scale/, gpu/."""
