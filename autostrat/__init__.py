"""autostrat."""
