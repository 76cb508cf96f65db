"""Agent-Reach controller: validates intents, plans steps, owns every state transition."""
