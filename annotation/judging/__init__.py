"""What an annotator judges with: the rubric (versioned data) and the item payload shown to them."""
