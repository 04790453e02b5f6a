"""What tests share besides fixtures: helpers to start, drive and check fedqueue as a user would."""
