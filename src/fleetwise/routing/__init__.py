"""L3: routing policies (filters -> scorers -> picker), pure and synchronous."""
