"""Commands above the store and reader: what needs both."""
