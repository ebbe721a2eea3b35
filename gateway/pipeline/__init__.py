"""A request on its way in: validation, the history memo, body parts, fallback, pass-through paths, the
Responses view, token ids."""
