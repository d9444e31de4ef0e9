"""The display wing: number formats and tables, charts (data in, go.Figure out) and precision editing."""
