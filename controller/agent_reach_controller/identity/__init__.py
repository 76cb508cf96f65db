"""Who is calling: API keys, principals with a tenant and roles, and what each role may do."""
