"""Channels: where the owner's messages come from and replies go to."""
