# PostgreSQL from Debian's packages (15 in bookworm), for the compose file's postgres service
# (FEDQUEUE_POSTGRES_IMAGE) where no registry serves postgres:16-alpine. Like that image it reads
# POSTGRES_USER, POSTGRES_DB and POSTGRES_PASSWORD on its first start (an empty data volume).
ARG DEBIAN_IMAGE=fedqueue-debian:bookworm
FROM ${DEBIAN_IMAGE}

# No cluster of Debian's own (/var/lib/postgresql/15/main): the entrypoint makes one in PGDATA.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/no-main-cluster.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /run/postgresql \
    && chmod 700 /var/lib/postgresql/data

ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
VOLUME /var/lib/postgresql/data
USER postgres
EXPOSE 5432
# SIGINT is PostgreSQL's fast shutdown: connected workers do not hold `docker compose stop` up.
STOPSIGNAL SIGINT
ENTRYPOINT ["postgres-entrypoint.sh"]
CMD ["postgres"]
