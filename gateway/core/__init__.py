"""What every part shares: the exchange record, errors, settings, the routes configuration and the lanes' runtime."""
