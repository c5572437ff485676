"""The serving pod's side: fetching the merged model before vLLM starts."""
