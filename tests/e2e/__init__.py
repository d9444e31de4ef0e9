"""Real browser end to end: `streamlit run app.py` + headless chromium (Playwright)."""
