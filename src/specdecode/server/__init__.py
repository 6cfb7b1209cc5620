"""`specdecode serve`: an OpenAI-compatible server around the engine (specdecode/engine: the one
scheduler/step loop, its drafters, load control, metrics and trace).

app.py          the routes; intake.py: a request checked -> the engine's Request;
                answer.py: its samples submitted, streamed (SSE) or collected;
                handlers.py: every error; guard.py: auth, body limit, request ids
lifecycle.py    shutdown: drain, then fail what still runs (error event + [DONE], 503)
schemas.py      pydantic bodies, the OpenAI error body
responses.py    the OpenAI response bodies
"""
