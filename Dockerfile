FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY chat_templates ./chat_templates
COPY qualifications ./qualifications
COPY routes.yaml ./
RUN pip install --no-cache-dir .
EXPOSE 8080
CMD ["gateway", "serve", "--host", "0.0.0.0", "--port", "8080", "--routes", "/app/routes.yaml"]
