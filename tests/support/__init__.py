"""Helpers every test folder shares (issue 22): waiting for a condition; more move here as folders adopt them."""
