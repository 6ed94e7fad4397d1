"""The REST API's views (one module per area) and serializers (serializers/)."""
