"""Streamlit AppTest: one file per page, and the frame (sidebar, session)."""
