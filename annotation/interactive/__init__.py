"""Interactive studies: annotators write sessions against a retriever that a worker re-ranks each round."""
