{% macro cents_to_amount(column) -%}
    cast({{ column }} / 100.0 as numeric(12, 2))
{%- endmacro %}
