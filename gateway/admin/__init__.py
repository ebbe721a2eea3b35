"""The /admin review page and its JSON APIs."""
