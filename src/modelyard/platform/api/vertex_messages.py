"""The fields of the Vertex AI v1 messages a control-plane request may hold, as data: each message's
JSON field names and, for the fields that hold a message checked too, that message's name.

Read off ``google-cloud-aiplatform``'s v1 protos (their ``json_name``s); ``tests/platform/test_input_limits.py``
compares this table with the installed SDK, so a newer Vertex field is noticed there rather than refused
here. Messages not listed (explanation specs, conditional parameter specs, free-form ``Value`` fields)
are not checked field by field. modelyard's own extensions are in ``EXTENSIONS``, each with its reason.
"""
from __future__ import annotations

# message -> (its fields, {field: the listed message it holds, alone or in a list})
MESSAGES: dict[str, tuple[frozenset[str], dict[str, str]]] = {
    "Model": (frozenset((
        'artifactUri', 'baseModelSource', 'checkpoints', 'containerSpec', 'createTime', 'dataStats',
        'defaultCheckpointId', 'deployedModels', 'description', 'displayName', 'encryptionSpec',
        'etag', 'explanationSpec', 'labels', 'metadata', 'metadataArtifact', 'metadataSchemaUri',
        'modelSourceInfo', 'name', 'originalModelInfo', 'pipelineJob', 'predictSchemata',
        'satisfiesPzi', 'satisfiesPzs', 'supportedDeploymentResourcesTypes',
        'supportedExportFormats', 'supportedInputStorageFormats', 'supportedOutputStorageFormats',
        'trainingPipeline', 'updateTime', 'versionAliases', 'versionCreateTime',
        'versionDescription', 'versionId', 'versionUpdateTime'
    )), {"containerSpec": "ModelContainerSpec"}),
    "ModelContainerSpec": (frozenset((
        'args', 'command', 'deploymentTimeout', 'env', 'grpcPorts', 'healthProbe', 'healthRoute',
        'imageUri', 'invokeRoutePrefix', 'livenessProbe', 'ports', 'predictRoute',
        'sharedMemorySizeMb', 'startupProbe'
    )), {"env": "EnvVar", "ports": "Port", "grpcPorts": "Port"}),
    "EnvVar": (frozenset((
        'name', 'value'
    )), {}),
    "Port": (frozenset((
        'containerPort',
    )), {}),
    "UploadModelRequest": (frozenset((
        'model', 'modelId', 'parent', 'parentModel', 'serviceAccount'
    )), {"model": "Model"}),
    "MergeVersionAliasesRequest": (frozenset((
        'name', 'versionAliases'
    )), {}),
    "Endpoint": (frozenset((
        'clientConnectionConfig', 'createTime', 'dedicatedEndpointDns', 'dedicatedEndpointEnabled',
        'deployedModels', 'description', 'displayName', 'enablePrivateServiceConnect',
        'encryptionSpec', 'etag', 'genAiAdvancedFeaturesConfig', 'labels',
        'modelDeploymentMonitoringJob', 'name', 'network', 'predictRequestResponseLoggingConfig',
        'privateModelServerEnabled', 'privateServiceConnectConfig', 'satisfiesPzi', 'satisfiesPzs',
        'trafficSplit', 'updateTime'
    )), {"deployedModels": "DeployedModel"}),
    "DeployedModel": (frozenset((
        'automaticResources', 'checkpointId', 'createTime', 'dedicatedResources',
        'disableContainerLogging', 'disableExplanations', 'displayName', 'enableAccessLogging',
        'explanationSpec', 'fasterDeploymentConfig', 'id', 'model', 'modelVersionId',
        'privateEndpoints', 'serviceAccount', 'sharedResources', 'speculativeDecodingSpec',
        'status', 'systemLabels'
    )), {
        "dedicatedResources": "DedicatedResources",
        "automaticResources": "AutomaticResources",
    }),
    "DedicatedResources": (frozenset((
        'autoscalingMetricSpecs', 'machineSpec', 'maxReplicaCount', 'minReplicaCount',
        'requiredReplicaCount', 'spot'
    )), {
        "machineSpec": "MachineSpec",
        "autoscalingMetricSpecs": "AutoscalingMetricSpec",
    }),
    "MachineSpec": (frozenset((
        'acceleratorCount', 'acceleratorType', 'gpuPartitionSize', 'machineType',
        'reservationAffinity', 'tpuTopology'
    )), {}),
    "AutoscalingMetricSpec": (frozenset((
        'metricName', 'target'
    )), {}),
    "AutomaticResources": (frozenset((
        'maxReplicaCount', 'minReplicaCount'
    )), {}),
    "DeploymentResourcePool": (frozenset((
        'createTime', 'dedicatedResources', 'disableContainerLogging', 'encryptionSpec', 'name',
        'satisfiesPzi', 'satisfiesPzs', 'serviceAccount'
    )), {"dedicatedResources": "DedicatedResources"}),
    "CreateDeploymentResourcePoolRequest": (frozenset((
        'deploymentResourcePool', 'deploymentResourcePoolId', 'parent'
    )), {"deploymentResourcePool": "DeploymentResourcePool"}),
    "DeployModelRequest": (frozenset((
        'deployedModel', 'endpoint', 'trafficSplit'
    )), {"deployedModel": "DeployedModel"}),
    "UndeployModelRequest": (frozenset((
        'deployedModelId', 'endpoint', 'trafficSplit'
    )), {}),
    "BatchPredictionJob": (frozenset((
        'completionStats', 'createTime', 'dedicatedResources', 'disableContainerLogging',
        'displayName', 'encryptionSpec', 'endTime', 'error', 'explanationSpec',
        'generateExplanation', 'inputConfig', 'instanceConfig', 'labels',
        'manualBatchTuningParameters', 'model', 'modelParameters', 'modelVersionId', 'name',
        'outputConfig', 'outputInfo', 'partialFailures', 'resourcesConsumed', 'satisfiesPzi',
        'satisfiesPzs', 'serviceAccount', 'startTime', 'state', 'unmanagedContainerModel',
        'updateTime',
    )), {
        "inputConfig": "BatchPredictionJob.InputConfig",
        "instanceConfig": "BatchPredictionJob.InstanceConfig",
        "outputConfig": "BatchPredictionJob.OutputConfig",
        "dedicatedResources": "BatchDedicatedResources",
        "manualBatchTuningParameters": "ManualBatchTuningParameters",
    }),
    "BatchPredictionJob.InputConfig": (frozenset((
        'bigquerySource', 'gcsSource', 'instancesFormat', 'vertexMultimodalDatasetSource'
    )), {"gcsSource": "GcsSource"}),
    "GcsSource": (frozenset((
        'uris',
    )), {}),
    "BatchPredictionJob.InstanceConfig": (frozenset((
        'excludedFields', 'includedFields', 'instanceType', 'keyField'
    )), {}),
    "BatchPredictionJob.OutputConfig": (frozenset((
        'bigqueryDestination', 'gcsDestination', 'predictionsFormat',
        'vertexMultimodalDatasetDestination',
    )), {"gcsDestination": "GcsDestination"}),
    "GcsDestination": (frozenset((
        'outputUriPrefix',
    )), {}),
    "BatchDedicatedResources": (frozenset((
        'machineSpec', 'maxReplicaCount', 'startingReplicaCount'
    )), {"machineSpec": "MachineSpec"}),
    "ManualBatchTuningParameters": (frozenset((
        'batchSize',
    )), {}),
    "CustomJob": (frozenset((
        'createTime', 'displayName', 'encryptionSpec', 'endTime', 'error', 'jobSpec', 'labels',
        'name', 'satisfiesPzi', 'satisfiesPzs', 'startTime', 'state', 'updateTime', 'webAccessUris'
    )), {"jobSpec": "CustomJobSpec"}),
    "CustomJobSpec": (frozenset((
        'baseOutputDirectory', 'enableDashboardAccess', 'enableWebAccess', 'experiment',
        'experimentRun', 'models', 'network', 'persistentResourceId', 'protectedArtifactLocationId',
        'pscInterfaceConfig', 'reservedIpRanges', 'scheduling', 'serviceAccount', 'tensorboard',
        'workerPoolSpecs',
    )), {
        "workerPoolSpecs": "WorkerPoolSpec",
        "scheduling": "Scheduling",
        "baseOutputDirectory": "GcsDestination",
    }),
    "WorkerPoolSpec": (frozenset((
        'containerSpec', 'diskSpec', 'lustreMounts', 'machineSpec', 'nfsMounts',
        'pythonPackageSpec', 'replicaCount'
    )), {
        "containerSpec": "ContainerSpec",
        "pythonPackageSpec": "PythonPackageSpec",
        "machineSpec": "MachineSpec",
        "diskSpec": "DiskSpec",
    }),
    "ContainerSpec": (frozenset((
        'args', 'command', 'env', 'imageUri'
    )), {"env": "EnvVar"}),
    "PythonPackageSpec": (frozenset((
        'args', 'env', 'executorImageUri', 'packageUris', 'pythonModule'
    )), {"env": "EnvVar"}),
    "DiskSpec": (frozenset((
        'bootDiskSizeGb', 'bootDiskType'
    )), {}),
    "Scheduling": (frozenset((
        'disableRetries', 'maxWaitDuration', 'restartJobOnWorkerRestart', 'strategy', 'timeout'
    )), {}),
    "HyperparameterTuningJob": (frozenset((
        'createTime', 'displayName', 'encryptionSpec', 'endTime', 'error', 'labels',
        'maxFailedTrialCount', 'maxTrialCount', 'name', 'parallelTrialCount', 'satisfiesPzi',
        'satisfiesPzs', 'startTime', 'state', 'studySpec', 'trialJobSpec', 'trials', 'updateTime'
    )), {"studySpec": "StudySpec", "trialJobSpec": "CustomJobSpec"}),
    "StudySpec": (frozenset((
        'algorithm', 'convexAutomatedStoppingSpec', 'decayCurveStoppingSpec',
        'measurementSelectionType', 'medianAutomatedStoppingSpec', 'metrics', 'observationNoise',
        'parameters', 'studyStoppingConfig'
    )), {"metrics": "StudySpec.MetricSpec", "parameters": "StudySpec.ParameterSpec"}),
    "StudySpec.MetricSpec": (frozenset((
        'goal', 'metricId', 'safetyConfig'
    )), {}),
    "StudySpec.ParameterSpec": (frozenset((
        'categoricalValueSpec', 'conditionalParameterSpecs', 'discreteValueSpec', 'doubleValueSpec',
        'integerValueSpec', 'parameterId', 'scaleType'
    )), {
        "doubleValueSpec": "StudySpec.ParameterSpec.DoubleValueSpec",
        "integerValueSpec": "StudySpec.ParameterSpec.IntegerValueSpec",
        "categoricalValueSpec": "StudySpec.ParameterSpec.CategoricalValueSpec",
        "discreteValueSpec": "StudySpec.ParameterSpec.DiscreteValueSpec",
    }),
    "StudySpec.ParameterSpec.DoubleValueSpec": (frozenset((
        'defaultValue', 'maxValue', 'minValue'
    )), {}),
    "StudySpec.ParameterSpec.IntegerValueSpec": (frozenset((
        'defaultValue', 'maxValue', 'minValue'
    )), {}),
    "StudySpec.ParameterSpec.CategoricalValueSpec": (frozenset((
        'defaultValue', 'values'
    )), {}),
    "StudySpec.ParameterSpec.DiscreteValueSpec": (frozenset((
        'defaultValue', 'values'
    )), {}),
    # Vizier (resources/studies.py, resources/trials.py)
    "Study": (frozenset((
        'createTime', 'displayName', 'inactiveReason', 'name', 'state', 'studySpec'
    )), {"studySpec": "StudySpec"}),
    "Trial": (frozenset((
        'clientId', 'customJob', 'endTime', 'finalMeasurement', 'id', 'infeasibleReason', 'measurements',
        'name', 'parameters', 'startTime', 'state', 'webAccessUris'
    )), {"parameters": "Trial.Parameter", "finalMeasurement": "Measurement", "measurements": "Measurement"}),
    "Trial.Parameter": (frozenset(('parameterId', 'value')), {}),
    "Measurement": (frozenset(('elapsedDuration', 'metrics', 'stepCount')), {"metrics": "Measurement.Metric"}),
    "Measurement.Metric": (frozenset(('metricId', 'value')), {}),
    "SuggestTrialsRequest": (frozenset(('clientId', 'contexts', 'parent', 'suggestionCount')), {}),
    "AddTrialMeasurementRequest": (frozenset(('measurement', 'trialName')), {"measurement": "Measurement"}),
    "CompleteTrialRequest": (frozenset((
        'finalMeasurement', 'infeasibleReason', 'name', 'trialInfeasible'
    )), {"finalMeasurement": "Measurement"}),
    "StopTrialRequest": (frozenset(('name',)), {}),
    "CheckTrialEarlyStoppingStateRequest": (frozenset(('trialName',)), {}),
    "ListOptimalTrialsRequest": (frozenset(('parent',)), {}),
    "LookupStudyRequest": (frozenset(('displayName', 'parent')), {}),
    "TrainingPipeline": (frozenset((
        'createTime', 'displayName', 'encryptionSpec', 'endTime', 'error', 'inputDataConfig',
        'labels', 'modelId', 'modelToUpload', 'name', 'parentModel', 'startTime', 'state',
        'trainingTaskDefinition', 'trainingTaskInputs', 'trainingTaskMetadata', 'updateTime'
    )), {"modelToUpload": "Model"}),
}

# modelyard's fields beyond Vertex's, by message: accepted as known fields.
EXTENSIONS: dict[str, frozenset[str]] = {
    "DeployModelRequest": frozenset({"shadowTrafficPercentage"}),
    # the memory budget of a pool's models loaded on demand (docs/pools.md); Vertex sizes pools by machine type
    "DeploymentResourcePool": frozenset({"modelMemoryBudgetBytes"}),  # shadow deployments (README, Endpoints)
    "HyperparameterTuningJob": frozenset({"modelyardTrialFiles"}),  # files `jobs submit` ships with a study
}
