"""FedRevive: FedBuff whose stale updates are mixed with a distilled one; its config section."""
