# RECAP Studio on a Hugging Face Space (docker SDK) or any container host: serves app.py on port 7860.
FROM python:3.11-slim

# Spaces run containers as uid 1000; HF_HOME must be writable by that user for hub downloads.
RUN useradd --create-home --uid 1000 user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    HF_HOME=/home/user/.cache/huggingface \
    NUMBA_CACHE_DIR=/home/user/.cache/numba \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860
USER 1000
WORKDIR /home/user/app

# Dependencies first, so that code changes do not reinstall them.
COPY --chown=1000:1000 requirements.txt .
RUN pip install --user -r requirements.txt

COPY --chown=1000:1000 . .
# Compile RECAP's numba kernels into the image's cache, so that a container starts in seconds.
RUN python -c "from recap.drafters.recap.search import compile_kernels; compile_kernels()"

EXPOSE 7860
CMD ["python", "app.py"]
