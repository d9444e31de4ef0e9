"""The store wing: what is saved in the workspace — results, runs, saved projects and drafts."""
