"""The gateway's own endpoints: status, the model list, the OpenAPI document."""
