"""The REST edge: FastAPI routes, problem+json errors, request and response shapes."""
