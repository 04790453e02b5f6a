"""What users see of an FL run: its status summary, its part of the report and its pictures, progress bars."""
