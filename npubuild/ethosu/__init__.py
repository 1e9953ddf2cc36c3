"""ethosu."""
