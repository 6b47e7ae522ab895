"""Building studies: item pools, stratified sampling."""
